#!/usr/bin/env bash
# Make a CA and certificates for the scheduler, the workers and the clients (TLS with client certificates).
#   deploy/make-certs.sh DIR [HOST ...]     (HOSTs go into subjectAltName; localhost and 127.0.0.1 always)
# Copy DIR/ca.pem everywhere; scheduler*.pem to the scheduler node, worker*.pem to worker nodes, client*.pem
# to the people who may submit work. Keys are mode 600. Certificates last 365 days.
set -euo pipefail
dir=${1:?usage: deploy/make-certs.sh DIR [HOST ...]}; shift || true
command -v openssl >/dev/null || { echo "make-certs.sh needs openssl" >&2; exit 2; }
mkdir -p "$dir"; umask 077
san="DNS:localhost,IP:127.0.0.1"
for h in "$@" "$(hostname)"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san="$san,IP:$h"; else san="$san,DNS:$h"; fi
done
openssl req -x509 -newkey rsa:3072 -nodes -days 365 -subj "/CN=multireduce-ca" \
  -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
for role in scheduler worker client; do
  openssl req -newkey rsa:3072 -nodes -subj "/CN=multireduce-$role" \
    -keyout "$dir/$role-key.pem" -out "$dir/$role.csr" 2>/dev/null
  printf "subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n" "$san" > "$dir/$role.ext"
  openssl x509 -req -in "$dir/$role.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" -CAcreateserial \
    -days 365 -extfile "$dir/$role.ext" -out "$dir/$role.pem" 2>/dev/null
  rm -f "$dir/$role.csr" "$dir/$role.ext"
done
chmod 644 "$dir"/*.pem; chmod 600 "$dir"/*-key.pem
echo "certificates in $dir: ca.pem, scheduler.pem, worker.pem, client.pem (+ keys)"
