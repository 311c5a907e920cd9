"""The opt bake's texture fit: its schedule, and its loop on the host without torch."""
