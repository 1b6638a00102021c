module gpushare.io/fakenvml/probe

go 1.22

require github.com/NVIDIA/go-nvml v0.13.4-1
