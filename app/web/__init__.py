"""The web front end: the page as data (``page``), its handlers and wiring, the script
API's endpoints, and the server machinery they share (sessions, jobs, results)."""
