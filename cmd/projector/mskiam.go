package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/twmb/franz-go/pkg/sasl"
	kaws "github.com/twmb/franz-go/pkg/sasl/aws"
)

// awsLookupTimeout bounds the first look-up of the AWS credentials, which
// may ask the instance's or the container's metadata service.
const awsLookupTimeout = 20 * time.Second

// mskIAM finds the AWS credentials for Amazon MSK's IAM access control
// the way the AWS SDK and CLI do (environment variables, the shared
// credentials and config files and their profile, web identity, SSO, the
// container's or the instance's role), and hands them to each login.
// Credentials that expire (a role's) are renewed by the SDK before they
// do; the shared files are loaded again when they change, so that a key
// rotated in a mounted file reaches the next login.
type mskIAM struct {
	mu     sync.Mutex
	cfg    aws.Config
	stamps map[string]fileStamp
}

// fileStamp is what tells a shared file changed.
type fileStamp struct {
	mod  time.Time
	size int64
	ok   bool
}

func newMSKIAM() (sasl.Mechanism, error) {
	m := &mskIAM{}
	ctx, cancel := context.WithTimeout(context.Background(), awsLookupTimeout)
	defer cancel()
	if _, err := m.auth(ctx); err != nil {
		return nil, err
	}
	return kaws.ManagedStreamingIAM(m.auth), nil
}

// sharedFiles are the AWS SDK's shared credentials and config files.
func sharedFiles() []string {
	creds := os.Getenv("AWS_SHARED_CREDENTIALS_FILE")
	if creds == "" {
		creds = awsconfig.DefaultSharedCredentialsFilename()
	}
	conf := os.Getenv("AWS_CONFIG_FILE")
	if conf == "" {
		conf = awsconfig.DefaultSharedConfigFilename()
	}
	return []string{creds, conf}
}

func stampsOf(files []string) map[string]fileStamp {
	out := map[string]fileStamp{}
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			out[f] = fileStamp{mod: fi.ModTime(), size: fi.Size(), ok: true}
		} else {
			out[f] = fileStamp{}
		}
	}
	return out
}

func sameStamps(a, b map[string]fileStamp) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !v.mod.Equal(w.mod) || v.size != w.size || v.ok != w.ok {
			return false
		}
	}
	return true
}

// auth returns the credentials for one login.
func (m *mskIAM) auth(ctx context.Context) (kaws.Auth, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	stamps := stampsOf(sharedFiles())
	if m.stamps == nil || !sameStamps(stamps, m.stamps) {
		cfg, err := awsconfig.LoadDefaultConfig(ctx)
		if err != nil {
			return kaws.Auth{}, fmt.Errorf("--kafka-sasl-mechanism aws-msk-iam: load the AWS configuration: %w", err)
		}
		m.cfg, m.stamps = cfg, stamps
	}
	if m.cfg.Credentials == nil {
		return kaws.Auth{}, fmt.Errorf("--kafka-sasl-mechanism aws-msk-iam: no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or give the pod or instance a role")
	}
	creds, err := m.cfg.Credentials.Retrieve(ctx)
	if err != nil {
		m.stamps = nil // a file written meanwhile is read at the next login
		return kaws.Auth{}, fmt.Errorf("--kafka-sasl-mechanism aws-msk-iam: no AWS credentials found (environment, shared files, web identity, container or instance role): %w", err)
	}
	return kaws.Auth{AccessKey: creds.AccessKeyID, SecretKey: creds.SecretAccessKey, SessionToken: creds.SessionToken, UserAgent: "projector/" + readBuild().Version}, nil
}
