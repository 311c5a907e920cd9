"""The page as data (``layout``), its stylesheet and scripts, the events' wiring, the status line,
the viewer's light and the handlers around both tabs."""
