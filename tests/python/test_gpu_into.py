"""Client.get_into on CUDA (docs/views.md, section 2): a publisher process
puts a bfloat16 state dict of device memory; this process loads it into
the parameters of its own torch module (memory torch allocated), device to
device:

  - the parameters equal the published tensors, and stay the module's
    (same data_ptr, same device);
  - a refused call (a shape) changes no parameter;
  - dtype_cast=True into a float32 module casts on the GPU;
  - a second get_into maps nothing new, and adds no device memory.

run_tests.py skips (77) without torch or a CUDA device.
"""
import unittest

import st_fixture

st_fixture.add_package_path()

import torch  # noqa: E402

import sharedtensor as st  # noqa: E402
from test_into import open_cache_stats  # noqa: E402
from test_keys import in_child  # noqa: E402

SHAPES = {"embed.weight": (64, 32), "layers.0.weight": (96, 32), "layers.0.bias": (96,),
          "layers.1.weight": (32, 96)}


class Net(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32, device="cuda", dtype=dtype)
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(32, 96, device="cuda", dtype=dtype),
            torch.nn.Linear(96, 32, bias=False, device="cuda", dtype=dtype))


class GpuGetIntoTest(st_fixture.ServerTestCase):
    SERVER_OPTIONS = {"config": "memory_budget = { cpu = 64 * 2^20, [\"cuda:0\"] = 2^30 },"}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        code = "shapes = %r\nsd = {}\n" % SHAPES + """
for i, (name, shape) in enumerate(shapes.items()):
    sd[name] = st.empty(shape, dtype=torch.bfloat16, device="cuda")
    sd[name].copy_(torch.randn(shape, generator=torch.Generator().manual_seed(i)).cuda())
torch.cuda.synchronize()
assert c.put("model", sd) == 1
"""
        rc, out = in_child(cls.srv.socket, code)
        if rc != 0:
            raise AssertionError(out)

    def published(self):
        return {name: torch.randn(shape, generator=torch.Generator().manual_seed(i))
                .to(torch.bfloat16).cuda() for i, (name, shape) in enumerate(SHAPES.items())}

    def test_d2d_into_torch_allocated_parameters(self):
        net = Net(torch.bfloat16)
        ptrs = {n: p.data_ptr() for n, p in net.named_parameters()}
        self.assertEqual(self.c.get_into("model", net), 1)
        torch.cuda.current_stream().synchronize()
        want = self.published()
        for n, p in net.named_parameters():
            self.assertTrue(torch.equal(p, want[n]), n)
            self.assertEqual(p.data_ptr(), ptrs[n])
            self.assertEqual(p.device, torch.device("cuda:0"))

    def test_a_refusal_changes_no_parameter(self):
        net = Net(torch.bfloat16)
        before = {n: p.detach().clone() for n, p in net.named_parameters()}
        d = dict(net.state_dict())
        d["layers.1.weight"] = torch.zeros((96, 32), dtype=torch.bfloat16, device="cuda")
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.get_into("model", d)
        self.assertIn("'layers.1.weight': shape [96, 32] here, [32, 96] in the source",
                      str(cm.exception))
        torch.cuda.synchronize()
        for n, p in net.named_parameters():
            self.assertTrue(torch.equal(p, before[n]), n)

    def test_dtype_cast_on_the_gpu(self):
        net = Net(torch.float32)
        with self.assertRaises(st.InvalidArgumentError):
            self.c.get_into("model", net)
        self.c.get_into("model", net, dtype_cast=True)
        torch.cuda.synchronize()
        want = self.published()
        for n, p in net.named_parameters():
            self.assertTrue(torch.equal(p, want[n].float()), n)

    def test_a_second_get_into_maps_nothing_new(self):
        net = Net(torch.bfloat16)
        self.c.get_into("model", net)
        torch.cuda.synchronize()
        mapped, reused = open_cache_stats()
        free0 = torch.cuda.mem_get_info(0)[0]
        for _ in range(3):
            self.c.get_into("model", net)
        torch.cuda.synchronize()
        again = open_cache_stats()
        self.assertEqual(again[0], mapped)
        self.assertEqual(again[1], reused)      # `same` replies: no descriptor came
        self.assertEqual(torch.cuda.mem_get_info(0)[0], free0)


if __name__ == "__main__":
    unittest.main()
