"""N-D and model parallel: one model split over a device mesh or over devices.

The mesh and its layouts, tensor-parallel plans, pipeline stages and their runner, device maps, gradient clipping
across meshes, and the strategies built on them (``NDParallelStrategy``, ``ModelParallelStrategy``)."""
