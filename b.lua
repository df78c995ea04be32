return { endpoints = "ep", peer = { id = "b", listen = "127.0.0.1:47123", secret = "key", peers = { a = {} } } }
