"""The kubelet DRA driver: GPU memory as consumable capacity of resource.k8s.io/v1 devices (KEP-5075)."""
