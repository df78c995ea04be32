-- Serves the repository's endpoints on the CPU for the consumer examples.
return { endpoints = "../../endpoints", workers = 2, default_device = "cpu" }
