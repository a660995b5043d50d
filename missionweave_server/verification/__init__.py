"""Checking command signatures in worker processes, off the event loop (MWP_VERIFY_WORKERS)."""
