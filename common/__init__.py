"""What every gpushare program shares: the command line, logging, settings plumbing, the heap, /metrics."""
