"""Stand-in for ``sam3d_objects.pipeline.inference_pipeline``: the base pipeline,
whose ``run`` has no ``with_layout_postprocess`` and no ``pointmap`` argument."""

from sam3d_objects.pipeline.inference_pipeline_pointmap import CALLS, InferencePipelinePointMap


class InferencePipeline(InferencePipelinePointMap):
    def run(self, image, mask=None, seed=42, stage1_only=False, with_mesh_postprocess=True,
            with_texture_baking=True, use_vertex_color=False, stage1_inference_steps=None,
            stage2_inference_steps=None, use_stage1_distillation=False, use_stage2_distillation=False,
            decode_formats=None, return_export_data=False):
        out = super().run(image, mask, seed, stage1_only=stage1_only,
                          with_mesh_postprocess=with_mesh_postprocess,
                          with_texture_baking=with_texture_baking, use_vertex_color=use_vertex_color)
        CALLS[-1][1]["base_pipeline"] = True
        out.pop("pointmap", None)
        out.pop("pointmap_colors", None)
        return out
