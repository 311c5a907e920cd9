"""Stage 5, bake: the texture baked from the views, the photo and a model's own colours;
baking a model another tool made (``model_inputs``, ``model_bake``)."""
