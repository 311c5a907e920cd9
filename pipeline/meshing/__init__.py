"""Stage 3, mesh: cleaning and simplifying the mesh."""
