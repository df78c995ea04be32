"""PyTorch consumer: a forward pass on weights the server built, in a
second process, without copying them.

    python3 examples/pytorch_consumer/consumer.py [SOCKET]

The parameters of the nn.Linear below become the shared tensors
(sharedtensor.load_into): their data_ptr is the server's allocation mapped
into this process.
"""
import sys

import torch

import sharedtensor


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else None
    with sharedtensor.Client(path=path) as c:
        with c.call("load_linear", input_dim=16, output_dim=4) as h:  # a lease
            state = h.value                                # OrderedDict of tensors
            layer = sharedtensor.load_into(torch.nn.Linear(16, 4), state)
            assert layer.weight.data_ptr() == state["weight"].data_ptr()  # no copy
            y = layer(torch.ones(16))
            for i, v in enumerate(y.tolist()):
                print("y[%d] = %.6f" % (i, v))
            print("object %d (cache key %s) shared, not copied" % (h.object_id, h.cache_key))


if __name__ == "__main__":
    main()
