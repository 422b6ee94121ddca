"""Metal shader sources (data only), shipped as `vidgen._kernels.metal` and read by vidgen.ops.metal."""
