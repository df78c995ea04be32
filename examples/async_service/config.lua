-- Async service example: slow builds run as tasks that report progress.
return {
  endpoints = "endpoints",
  workers = 2,
  default_device = "cpu",
  tasks = { ttl_s = 60, capacity = 1000 },
}
