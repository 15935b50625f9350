package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func (e *Env) tlsConfig() *tls.Config {
	pool := x509.NewCertPool()
	if e.pki != nil {
		pool.AppendCertsFromPEM(e.pki.caPEM)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

func (e *Env) base() *rest.Config {
	return &rest.Config{Host: e.URL, TLSClientConfig: rest.TLSClientConfig{CAData: e.pki.caPEM}, QPS: 200, Burst: 400}
}

// AdminConfig is user test-admin in group system:masters.
func (e *Env) AdminConfig() *rest.Config {
	c := e.base()
	c.BearerToken = e.tokens["test-admin"]
	return c
}

// NodeConfig is user system:node:<name> in group system:nodes, the identity
// the agent gets from the kubelet's kubeconfig.
func (e *Env) NodeConfig(name string) *rest.Config {
	user := "system:node:" + name
	if t, ok := e.tokens[user]; ok {
		c := e.base()
		c.BearerToken = t
		return c
	}
	return e.UserConfig(user, "system:nodes")
}

// UserConfig is any identity, by a client certificate minted with the test CA.
// UserConfig("alice") is a plain user with no RBAC at all.
func (e *Env) UserConfig(user string, groups ...string) *rest.Config {
	if t, ok := e.tokens[user]; ok && len(groups) == 0 {
		c := e.base()
		c.BearerToken = t
		return c
	}
	cert, key, err := e.pki.issue("", user, groups, false)
	if err != nil {
		panic(err) // only fails if crypto/rand fails
	}
	c := e.base()
	c.CertData, c.KeyData = cert, key
	return c
}

// CAKeyPEM returns nothing secret beyond the test: the CA certificate in PEM.
func (e *Env) CAPEM() []byte { return e.pki.caPEM }

// WriteKubeconfig writes cfg as a kubeconfig file (mode 0600).
func WriteKubeconfig(path string, cfg *rest.Config) error {
	user := &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	name := "user"
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[name] = user
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: name}
	kc.CurrentContext = "test"
	b, err := clientcmd.Write(*kc)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// WriteKubeconfigFor writes a kubeconfig for an identity into the env's dir
// and returns its path. who is "admin", "node:<name>" or a user name.
func (e *Env) WriteKubeconfigFor(who string) (string, error) {
	var cfg *rest.Config
	switch {
	case who == "admin":
		cfg = e.AdminConfig()
	case strings.HasPrefix(who, "node:"):
		cfg = e.NodeConfig(strings.TrimPrefix(who, "node:"))
	default:
		cfg = e.UserConfig(who)
	}
	p := e.Dir + "/" + strings.NewReplacer(":", "-", "/", "-").Replace(who) + ".kubeconfig"
	return p, WriteKubeconfig(p, cfg)
}
