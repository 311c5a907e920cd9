"""What the server keeps per browser and tab: sessions, the tab's image state, its jobs and their
outcomes, fitted cameras, the history."""
