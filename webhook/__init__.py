"""The admission side of gpushare: the admission rules (webhook.rules) and the server of them (webhook.server)."""
