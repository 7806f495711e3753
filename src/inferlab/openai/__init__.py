"""The OpenAI wire format, shared by the client, the simulated server and the gateway:
Server-Sent Events (parse and encode) and the request, response and error bodies.
Imports nothing else of inferlab's but its errors.

- ``sse``: ``SSEParser`` (bytes in any split → events' data), ``encode_event``,
  ``encode_json``, ``DONE`` / ``DONE_EVENT``.
- ``request``: ``completion_request`` builds a chat or completions request body;
  ``parse_body``, ``read_messages``, ``read_prompt``, ``read_params`` read one.
- ``response``: ``Completion`` and ``usage`` build chunks and whole bodies;
  ``ResponseReader`` reads them back.
- ``errors``: ``APIError`` and ``error_body`` answer with an error; ``error_message`` and
  ``one_line`` read one.
"""
