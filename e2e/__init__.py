"""The real-cluster tier: upstream Kubernetes, containerd and runc on this machine, with gpushare beside them."""
