"""The admission side of gpushare, and the annotation contract it shares with the device plugin."""
