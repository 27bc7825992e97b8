#!/usr/bin/env bash
# Make a CA and certificates for the scheduler, the workers and the clients (TLS with client certificates).
#   deploy/make-certs.sh DIR [HOST ...]     (HOSTs go into subjectAltName; localhost and 127.0.0.1 always)
# DIR gets ca.pem and the role certificates and keys: copy DIR/ca.pem everywhere, scheduler*.pem to the
# scheduler node, worker*.pem to worker nodes, client*.pem to the people who may submit work. The CA key,
# which can sign a certificate for anyone, goes to a separate folder (MR_CA_DIR, default DIR-ca) that is
# never copied to nodes. Keys are mode 600. Certificates last 365 days.
set -euo pipefail
dir=${1:?usage: deploy/make-certs.sh DIR [HOST ...]}; shift || true
dir=${dir%/}
cadir=${MR_CA_DIR:-$dir-ca}
command -v openssl >/dev/null || { echo "make-certs.sh needs openssl" >&2; exit 2; }
case "$(realpath -m "$cadir")/" in  # DIR is what gets copied to nodes: the CA key must not ride along
  "$(realpath -m "$dir")/"*) echo "MR_CA_DIR ($cadir) must not be inside $dir" >&2; exit 2;;
esac
umask 077; mkdir -p "$dir" "$cadir"
san="DNS:localhost,IP:127.0.0.1"
for h in "$@" "$(hostname)"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san="$san,IP:$h"; else san="$san,DNS:$h"; fi
done
openssl req -x509 -newkey rsa:3072 -nodes -days 365 -subj "/CN=multireduce-ca" \
  -keyout "$cadir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
for role in scheduler worker client; do
  openssl req -newkey rsa:3072 -nodes -subj "/CN=multireduce-$role" \
    -keyout "$dir/$role-key.pem" -out "$cadir/$role.csr" 2>/dev/null
  printf "subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n" "$san" > "$cadir/$role.ext"
  openssl x509 -req -in "$cadir/$role.csr" -CA "$dir/ca.pem" -CAkey "$cadir/ca-key.pem" \
    -CAserial "$cadir/ca.srl" -CAcreateserial -days 365 -extfile "$cadir/$role.ext" -out "$dir/$role.pem" 2>/dev/null
  rm -f "$cadir/$role.csr" "$cadir/$role.ext"
done
chmod 644 "$dir"/*.pem; chmod 600 "$dir"/*-key.pem "$cadir/ca-key.pem"
echo "certificates in $dir: ca.pem, scheduler.pem, worker.pem, client.pem (+ keys); CA key in $cadir (keep it off the nodes)"
