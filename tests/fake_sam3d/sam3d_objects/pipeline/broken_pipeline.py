"""A pipeline module whose dependencies are missing, as when pytorch3d is not installed."""
raise ImportError("No module named 'pytorch3d'")
