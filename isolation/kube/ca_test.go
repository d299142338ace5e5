package kube_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/isolation"
	"github.com/berth-dev/berth/isolation/kube"
)

// testCA is a fresh CA's certificate and key, PEM.
func testCA(t *testing.T) (cert, key []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth run CA (test)"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// Only certificates reach a pod: a bundle with a key in it, or with
// anything that is not PEM, is refused. Control: the certificate alone passes.
func TestKubernetesCABundleCarriesCertificatesOnly(t *testing.T) {
	cert, key := testCA(t)
	if got, err := kube.CertificatesOnly(cert); err != nil || string(got) != string(cert) {
		t.Fatalf("a certificate: %q, %v", got, err)
	}
	for name, bundle := range map[string][]byte{
		"a key after the certificate": append(slices.Clone(cert), key...),
		"a key alone":                 key,
		"junk after the certificate":  append(slices.Clone(cert), "not pem"...),
		"nothing":                     nil,
	} {
		if got, err := kube.CertificatesOnly(bundle); err == nil {
			t.Errorf("%s: passed as %q", name, got)
		}
	}
}

// caSpec is c.spec of a run whose egress proxy intercepts TLS with the CA
// in file bundle.
func (c cluster) caSpec(t *testing.T, img, bundle, text string) isolation.Spec {
	s := c.spec(t, img, text)
	s.Egress = &isolation.EgressPlan{Socket: "/nonexistent/egress.sock", SandboxSocket: isolation.KubeEgressSocketPrefix + c.proxy,
		ProxyAddr: "127.0.0.1:3128", CABundle: bundle, SandboxCABundle: "/run/berth-egress/ca.pem"}
	s.Policy.AllowRead = append(slices.Clone(s.Policy.AllowRead), s.Egress.SandboxCABundle)
	s.EgressToken = "kube-ca-test-run-token" // no router answers it: the run makes no request out
	return s
}

// A run whose proxy intercepts TLS finds the run's CA certificate at its
// plan's path, read-only, from a ConfigMap the pod owns (the garbage
// collector deletes it with the pod); the CA's key is never in the
// cluster: a bundle holding one fails the run before any pod is made.
func TestKubernetesRunGetsItsCACertificateAndNeverItsKey(t *testing.T) {
	c := newCluster(t)
	img := image(t)
	cert, key := testCA(t)
	dir := t.TempDir()
	certFile, keyed := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "keyed.pem")
	if err := os.WriteFile(certFile, cert, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyed, append(slices.Clone(cert), key...), 0o644); err != nil {
		t.Fatal(err)
	}
	s := c.caSpec(t, img, certFile, "/sh cat /run/berth-egress/ca.pem; echo x > /run/berth-egress/ca.pem; echo write=$?; ls /run/berth-egress")
	pod := c.podOf(t, &s)
	res, err := run(t, c.b, s)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, res.Stderr)
	}
	reply := res.Response.Reply
	if !strings.Contains(reply, strings.TrimSpace(string(cert))) || !strings.Contains(reply, "write=1") {
		t.Errorf("the pod's CA: %q, want the certificate, read-only", reply)
	}
	p := <-pod
	cm, err := c.cs.CoreV1().ConfigMaps(c.ns).Get(context.Background(), kube.CAConfigMapName(s.RunID, s.Attempt), metav1.GetOptions{})
	if err != nil {
		// The pod may be gone and its ConfigMap collected already; that
		// is checked below.
		if !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	} else {
		if len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].UID != p.UID || len(cm.Data) != 1 || strings.Contains(cm.Data["ca.pem"], "PRIVATE") {
			t.Errorf("CA ConfigMap %+v: want the certificate only, owned by pod %s", cm, p.Name)
		}
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+s.RunID)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := c.cs.CoreV1().ConfigMaps(c.ns).Get(context.Background(), kube.CAConfigMapName(s.RunID, s.Attempt), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the CA ConfigMap outlived its pod (%v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	bad := c.caSpec(t, img, keyed, "/sh echo never")
	if _, err := run(t, c.b, bad); isolation.ReasonOf(err) != isolation.ReasonStart || !strings.Contains(err.Error(), "only certificates") {
		t.Fatalf("a run whose bundle holds the key = %v, want it refused", err)
	}
	waitGone(t, c.cs, c.ns, kube.LabelRun+"="+bad.RunID)
	if _, err := c.cs.CoreV1().ConfigMaps(c.ns).Get(context.Background(), kube.CAConfigMapName(bad.RunID, bad.Attempt), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a ConfigMap was made for the refused bundle (%v)", err)
	}
}
