-- Serves the repository's endpoints (echo and scale among them) on the CPU.
return { endpoints = "../../endpoints", workers = 2, default_device = "cpu" }
