#!/usr/bin/env bash
# Writes a throwaway CA (ca.pem) and a server certificate for 127.0.0.1 (server.pem,
# server.key; RSA 2048, 2 days) into directory $1. Used by the TLS benchmarks.
set -euo pipefail
cd "$1"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=bench CA" 2>/dev/null
echo "subjectAltName=IP:127.0.0.1" >san.cnf
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1" 2>/dev/null
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 \
    -extfile san.cnf 2>/dev/null
