import socket, sys, time
port = int(sys.argv[1]); n = int(sys.argv[2]); size = int(sys.argv[3])
def conn():
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00")
    buf = b""
    while b"\x00" not in buf:
        buf += s.recv(4096)
    return s
sub = conn()
sub.sendall(b"SUBSCRIBE\nid:1\ndestination:/topic/s.x\nack:auto\n\n\x00")
time.sleep(0.5)
pub = conn()
body = b"x" * size
frame = b"SEND\ndestination:/topic/s.x\ncontent-length:%d\n\n" % size + body + b"\x00"
t0=time.time()
for i in range(n):
    pub.sendall(frame)
    buf = b""
    while b"\x00" not in buf:
        buf += sub.recv(65536)
print("rtt us", (time.time()-t0)/n*1e6)
