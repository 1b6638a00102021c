"""The admission side of gpushare: the mutating and validating webhook server."""
