-- The prefill/decode example: no endpoint is called; budgets the published
-- weights and KV pool fit in (CPU, and cuda:0 when the example runs there).
return { endpoints = "../../endpoints", workers = 1, default_device = "cpu",
         memory_budget = { cpu = 256 * 1024 * 1024, ["cuda:0"] = 1024 * 1024 * 1024 } }
