"""The bus to the boards: request/reply proxies with retransmission, serial links, port discovery, and
fault injection on links."""
