"""Reward model server: a request thread and a cache refresher thread.

Lock-order bug: the request path takes lock_cache then lock_model; the cache
refresher takes lock_model then lock_cache. Around step 8 they interleave and
deadlock; the server never replies.
"""
import socket
import sys
import threading
import time

lock_cache = threading.Lock()
lock_model = threading.Lock()
cache = {}
model_version = [0]
requests_served = [0]


def score_responses(responses):
    # request thread: cache first, then model
    with lock_cache:
        if requests_served[0] >= 7:
            time.sleep(0.3)  # cache miss path is slower (lets the refresher take lock_model)
        with lock_model:
            scores = [float(len(r) % 7) / 7.0 + model_version[0] * 0.0 for r in responses]
            for r, s in zip(responses, scores):
                cache[r] = s
    requests_served[0] += 1
    return scores


def refresh_cache():
    # cache refresher thread: model first, then cache
    while True:
        time.sleep(0.05)
        with lock_model:
            model_version[0] += 1
            if requests_served[0] >= 7:
                time.sleep(0.3)  # reloading weights takes a while
            with lock_cache:
                cache.clear()


def handle_requests(conn):
    f = conn.makefile("rb")
    for line in f:
        responses = line.decode().rstrip("\n").split("\t")
        scores = score_responses(responses)
        conn.sendall((",".join("%.4f" % s for s in scores) + "\n").encode())


def main():
    port = int(sys.argv[1])
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1)
    print("reward server listening on", port, flush=True)
    conn, _ = srv.accept()
    t_req = threading.Thread(target=handle_requests, args=(conn,), name="request")
    t_ref = threading.Thread(target=refresh_cache, name="cache-refresher", daemon=True)
    t_req.start()
    t_ref.start()
    t_req.join()


if __name__ == "__main__":
    main()
