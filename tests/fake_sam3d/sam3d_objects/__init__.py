"""Test stand-in for facebookresearch/sam-3d-objects (``sam3d_objects``).

Same import paths, constructor and ``run`` signature and output keys as the
real package's ``InferencePipelinePointMap`` as Kiln uses it; it returns a
synthetic object with a known pose instead of running any model. See
``pipeline/inference_pipeline_pointmap.py``.
"""
