"""The "Bake a model" tab: Bake and "Fit the camera to the photo", their form and the fit's picture."""
