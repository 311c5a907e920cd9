"""The web front end, by concern: ``server`` (start-up, the shared context, browsers, requests),
``state`` (what is kept per browser and tab), ``page`` (the page as data and its wiring),
``photo`` and ``bake`` (each tab's handlers), ``api`` (the script endpoints)."""
