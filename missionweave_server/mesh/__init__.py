"""The mesh wiring: which services a process serves, how they reach each other, start-up and shutdown.

This package (and only this one) imports every service; the services import none of each other.
"""
