-- Model service example: a cached, managed, serialized model builder.
return {
  endpoints = "endpoints",
  workers = 4,
  default_device = "cpu",   -- set "socket" to build on the GPU of the socket
}
