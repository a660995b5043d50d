"""A2A v1.0 (lf.a2a.v1): A2A agents as Workers, and Missions as A2A tasks."""
