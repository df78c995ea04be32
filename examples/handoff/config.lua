-- The hand-off example: the repository's endpoints (none is called) and a
-- CPU budget the example's chunks fit in.
return { endpoints = "../../endpoints", workers = 1, default_device = "cpu",
         memory_budget = { cpu = 256 * 1024 * 1024 } }
