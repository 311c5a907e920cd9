"""The script API (``gradio_client``): the photo endpoints, /bake, /fit_camera and the table
that registers them; docs/api.md describes each."""
