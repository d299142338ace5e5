package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
)

// bufferedBytes is what the HTTP server read past the CONNECT request: the
// first bytes of the tunnel (a TLS ClientHello sent without waiting).
func bufferedBytes(rw *bufio.ReadWriter) []byte {
	n := rw.Reader.Buffered()
	if n == 0 {
		return nil
	}
	b, _ := rw.Reader.Peek(n)
	return append([]byte(nil), b...)
}

func tlsConfig(roots *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}
