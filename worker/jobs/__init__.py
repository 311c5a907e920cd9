"""Jobs and their inputs: the job store on disk, the input checks for photo and bake jobs (run
before any slow work) and the bake/fit job's stages over its folder."""
