-- The weight-update example: no endpoint is called; budgets the live key
-- (the model's weights) fits in, CPU and cuda:0.
return { endpoints = "../../endpoints", workers = 1, default_device = "cpu",
         memory_budget = { cpu = 256 * 1024 * 1024, ["cuda:0"] = 1024 * 1024 * 1024 } }
