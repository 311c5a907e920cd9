"""The server around the page: start-up, the shared context, browsers and their files, proxies,
what a request says about its caller, published results, text for the person."""
