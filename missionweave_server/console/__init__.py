"""Mission control: the browser console the mesh serves (docs/console.md, D178).

The server side holds no key and decides nothing: it serves the page's files and relays the page's
gRPC calls, byte for byte, to this mesh's own public listener (``relay.py``). Every read carries a
call proof and every action is a command the person's browser signed; the mesh checks both exactly
as for any other client.
"""
