"""Closing: the context-manager and collection behaviour of objects that own
a library handle (Client, Buffer): leaving a with block, or the object
being collected, calls its close(), which must be idempotent."""


class Closing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:   # interpreter teardown: the modules are going
            pass
