"""The OpenAI wire format, shared by the client, the simulated server and the gateway:
Server-Sent Events (parse and encode) and the request, response and error bodies.
Imports nothing else of inferlab's but its errors.
"""
