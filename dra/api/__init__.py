"""Kubelet DRA wire protocols: the DRAPlugin v1 and plugin registration .proto files and their generated code."""
