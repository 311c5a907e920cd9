"""Cameras: view rigs around an object, rotations, and fitting the photo's camera to a mask."""
