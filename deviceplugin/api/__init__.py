"""Kubelet wire protocols: our .proto files and the Python code generated from them."""
