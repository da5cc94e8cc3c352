package s3

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// creds are AWS credentials; Expires is zero for ones that do not expire.
type creds struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	Expires         time.Time
}

// credSource yields credentials, found through AWS's usual chain unless
// static ones are configured, and cached until five minutes before they
// expire.
type credSource struct {
	static *creds
	hc     *http.Client
	region string

	mu     sync.Mutex
	cached creds
}

// get returns credentials valid for at least a few more minutes.
func (s *credSource) get(ctx context.Context) (creds, error) {
	if s.static != nil {
		return *s.static, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cached.AccessKeyID != "" && (s.cached.Expires.IsZero() || time.Until(s.cached.Expires) > 5*time.Minute) {
		return s.cached, nil
	}
	c, from, err := s.chain(ctx)
	if err != nil && from != "" {
		return creds{}, fmt.Errorf("AWS credentials from the %s: %w", from, err)
	}
	if err != nil {
		return creds{}, err
	}
	s.cached = c
	return c, nil
}

// chain looks for credentials where the AWS SDKs do, in their order: the
// environment, the shared credentials file, web identity (EKS IRSA), the
// container endpoint (ECS, EKS Pod Identity), the EC2 instance role.
func (s *credSource) chain(ctx context.Context) (creds, string, error) {
	if id, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"); id != "" && secret != "" {
		return creds{AccessKeyID: id, SecretAccessKey: secret, SessionToken: os.Getenv("AWS_SESSION_TOKEN")}, "environment", nil
	}
	if c, ok, err := sharedFileCreds(); err != nil || ok {
		return c, "shared credentials file", err
	}
	if tokenFile, role := os.Getenv("AWS_WEB_IDENTITY_TOKEN_FILE"), os.Getenv("AWS_ROLE_ARN"); tokenFile != "" && role != "" {
		c, err := s.webIdentity(ctx, tokenFile, role)
		return c, "web identity", err
	}
	if os.Getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") != "" || os.Getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI") != "" {
		c, err := s.container(ctx)
		return c, "container credentials endpoint", err
	}
	if strings.EqualFold(os.Getenv("AWS_EC2_METADATA_DISABLED"), "true") {
		return creds{}, "", errors.New("no AWS credentials: none in the environment, the shared credentials file, web identity or the container endpoint, and AWS_EC2_METADATA_DISABLED is set")
	}
	c, err := s.instanceRole(ctx)
	if err != nil {
		return creds{}, "", fmt.Errorf("no AWS credentials: none in the environment, the shared credentials file, web identity or the container endpoint, and the EC2 instance role: %w", err)
	}
	return c, "EC2 instance role", nil
}

// profile is AWS_PROFILE, else "default".
func profile() string {
	if p := os.Getenv("AWS_PROFILE"); p != "" {
		return p
	}
	return "default"
}

// awsFile is env's path, else ~/.aws/name.
func awsFile(env, name string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".aws", name)
}

// iniSection reads section name of an INI file: its key = value pairs
// (nil when the file or the section is missing).
func iniSection(path, name string) (map[string]string, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var kv map[string]string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' && line[len(line)-1] == ']' {
			in = strings.TrimSpace(line[1:len(line)-1]) == name
			if in && kv == nil {
				kv = map[string]string{}
			}
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok && in {
			kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return kv, sc.Err()
}

// sharedFileCreds reads the profile's keys from the shared credentials
// file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials).
func sharedFileCreds() (creds, bool, error) {
	path := awsFile("AWS_SHARED_CREDENTIALS_FILE", "credentials")
	kv, err := iniSection(path, profile())
	if err != nil {
		return creds{}, false, fmt.Errorf("shared credentials file %s: %w", path, err)
	}
	if kv["aws_access_key_id"] == "" || kv["aws_secret_access_key"] == "" {
		return creds{}, false, nil
	}
	return creds{AccessKeyID: kv["aws_access_key_id"], SecretAccessKey: kv["aws_secret_access_key"], SessionToken: kv["aws_session_token"]}, true, nil
}

// configRegion is the profile's region in the shared config file
// (AWS_CONFIG_FILE, else ~/.aws/config), "" when none is set.
func configRegion() string {
	section := "profile " + profile()
	if profile() == "default" {
		section = "default"
	}
	kv, _ := iniSection(awsFile("AWS_CONFIG_FILE", "config"), section)
	return kv["region"]
}

// fetch sends method u (no body) with headers hdr and returns the body
// of a 200 answer.
func (s *credSource) fetch(ctx context.Context, method, u string, hdr map[string]string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: HTTP %d: %s", method, u, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// webIdentity exchanges the token in tokenFile for role's credentials
// through STS AssumeRoleWithWebIdentity (a call that needs no signature).
func (s *credSource) webIdentity(ctx context.Context, tokenFile, role string) (creds, error) {
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		return creds{}, fmt.Errorf("web identity token: %w", err)
	}
	session := os.Getenv("AWS_ROLE_SESSION_NAME")
	if session == "" {
		session = fmt.Sprintf("sluice-%d", time.Now().UnixNano())
	}
	endpoint := "https://sts." + s.region + ".amazonaws.com/"
	if e := os.Getenv("AWS_ENDPOINT_URL_STS"); e != "" {
		endpoint = strings.TrimSuffix(e, "/") + "/"
	}
	q := url.Values{
		"Action": {"AssumeRoleWithWebIdentity"}, "Version": {"2011-06-15"},
		"RoleArn": {role}, "RoleSessionName": {session}, "WebIdentityToken": {strings.TrimSpace(string(token))},
	}
	body, err := s.fetch(ctx, http.MethodGet, endpoint+"?"+q.Encode(), nil)
	if err != nil {
		return creds{}, fmt.Errorf("AssumeRoleWithWebIdentity: %w", err)
	}
	var out struct {
		Credentials struct {
			AccessKeyID     string    `xml:"AccessKeyId"`
			SecretAccessKey string    `xml:"SecretAccessKey"`
			SessionToken    string    `xml:"SessionToken"`
			Expiration      time.Time `xml:"Expiration"`
		} `xml:"AssumeRoleWithWebIdentityResult>Credentials"`
	}
	if err := xml.Unmarshal(body, &out); err != nil || out.Credentials.AccessKeyID == "" {
		return creds{}, fmt.Errorf("AssumeRoleWithWebIdentity: no credentials in the answer (%v)", err)
	}
	c := out.Credentials
	return creds{AccessKeyID: c.AccessKeyID, SecretAccessKey: c.SecretAccessKey, SessionToken: c.SessionToken, Expires: c.Expiration}, nil
}

// jsonCreds is the credentials document of the container endpoint and of
// the instance metadata service.
type jsonCreds struct {
	AccessKeyID     string    `json:"AccessKeyId"`
	SecretAccessKey string    `json:"SecretAccessKey"`
	Token           string    `json:"Token"`
	Expiration      time.Time `json:"Expiration"`
}

func (j jsonCreds) creds(from string) (creds, error) {
	if j.AccessKeyID == "" || j.SecretAccessKey == "" {
		return creds{}, fmt.Errorf("%s: no credentials in the answer", from)
	}
	return creds{AccessKeyID: j.AccessKeyID, SecretAccessKey: j.SecretAccessKey, SessionToken: j.Token, Expires: j.Expiration}, nil
}

// container reads the ECS / EKS Pod Identity credentials endpoint.
func (s *credSource) container(ctx context.Context) (creds, error) {
	u := os.Getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI")
	if rel := os.Getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"); rel != "" {
		u = "http://169.254.170.2" + rel
	}
	hdr := map[string]string{}
	token := os.Getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN")
	if f := os.Getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return creds{}, fmt.Errorf("container authorization token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token != "" {
		hdr["Authorization"] = token
	}
	body, err := s.fetch(ctx, http.MethodGet, u, hdr)
	if err != nil {
		return creds{}, err
	}
	var j jsonCreds
	if err := json.Unmarshal(body, &j); err != nil {
		return creds{}, fmt.Errorf("container credentials: %w", err)
	}
	return j.creds("container credentials")
}

// instanceRole reads the EC2 instance role's credentials through IMDSv2.
func (s *credSource) instanceRole(ctx context.Context) (creds, error) {
	base := "http://169.254.169.254"
	if e := os.Getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT"); e != "" {
		base = strings.TrimSuffix(e, "/")
	}
	tok, err := s.fetch(ctx, http.MethodPut, base+"/latest/api/token", map[string]string{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": "21600"})
	if err != nil {
		return creds{}, err
	}
	hdr := map[string]string{"X-Aws-Ec2-Metadata-Token": string(tok)}
	roles, err := s.fetch(ctx, http.MethodGet, base+"/latest/meta-data/iam/security-credentials/", hdr)
	if err != nil {
		return creds{}, err
	}
	role, _, _ := strings.Cut(strings.TrimSpace(string(roles)), "\n")
	if role == "" {
		return creds{}, errors.New("the instance has no IAM role")
	}
	body, err := s.fetch(ctx, http.MethodGet, base+"/latest/meta-data/iam/security-credentials/"+url.PathEscape(role), hdr)
	if err != nil {
		return creds{}, err
	}
	var j jsonCreds
	if err := json.Unmarshal(body, &j); err != nil {
		return creds{}, fmt.Errorf("instance role %s: %w", role, err)
	}
	return j.creds("instance role " + role)
}
