"""`kubectl gpushare`: every GPU slice of the cluster, read from node capacity and pod annotations."""
