"""The gpushare kubelet device plugin: hands a container its GPU from validated pod annotations only."""
