"""Selecting the object in the photo: SAM2 when its checkpoint is installed, else GrabCut."""
