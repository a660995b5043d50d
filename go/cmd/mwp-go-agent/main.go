// Command mwp-go-agent is a small MissionWeave agent in Go, built only on the standard library,
// the Go code generated from protos/ and Debian's Go packages (grpc, protobuf, lukechampine.com/blake3).
//
// It reads an identity key file written by `mwp keygen`, optionally registers that identity as an
// agent with the key's public half (MembershipService.RegisterIdentity, signed by an Organization
// administrator's key: --register-with), opens a session with a fresh session key
// (MembershipService.OpenSession, signed by the identity key), optionally posts a signed
// message.post command into a Group's Conversation (AuthorityService.ExecuteCommand), then reads
// the Group with call proofs (AuthorityService.ReadEvents, metadata mwp-call-proof-bin), verifying
// every event against the Authority's keys (GetAuthorityKey, rotated keys included) and printing
// one JSON line per verified event on stdout. Diagnostics go to stderr.
//
// Exit codes: 0 done, 1 refused or not verified (the reason on stderr), 2 usage.
//
// Usage: mwp-go-agent --as alice --key alice.key --group GROUP_ID [--register-with ADMIN_KEY]
//
//	[--post TEXT] [--follow | --until-sequence N]
//
// (docs/getting-started-go.md; mwp-go-agent -h lists every flag)
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/missionweave/missionweave/gen/go/missionweave/v1"
)

const clientName = "mwp-go-agent"

type options struct {
	target, as, keyFile, group    string
	post, conversation, pinnedHex string
	registerWith, admin           string
	afterSequence, untilSequence  uint64
	follow                        bool
	timeout                       time.Duration
}

// env is a flag's default from the environment, as `mwp` reads MWP_TARGET, MWP_AS and MWP_KEY.
func env(name, fallback string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return fallback
}

func parseOptions(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet(clientName, flag.ContinueOnError)
	fs.StringVar(&o.target, "target", env("MWP_TARGET", "127.0.0.1:50051"), "the mesh, host:port, plain text (also the call proofs' audience) [MWP_TARGET]")
	fs.StringVar(&o.as, "as", env("MWP_AS", ""), "the identity id (required) [MWP_AS]")
	fs.StringVar(&o.keyFile, "key", env("MWP_KEY", ""), "its identity key file, as `mwp keygen` writes it (required) [MWP_KEY]")
	fs.StringVar(&o.group, "group", "", "the Group (required)")
	fs.StringVar(&o.registerWith, "register-with", "", "first register --as as an agent with --key's public key, signed by this administrator key file (e.g. .missionweave/keys/admin.key)")
	fs.StringVar(&o.admin, "admin", "admin", "the administrator identity whose key --register-with names")
	fs.StringVar(&o.post, "post", "", "post this text as a message.post command before reading")
	fs.StringVar(&o.conversation, "conversation", "", "the Conversation to post into (default: the Mission's planning Conversation)")
	fs.StringVar(&o.pinnedHex, "authority-key", "", "pin an Authority Ed25519 public key (hex), current or rotated away from (default: trust GetAuthorityKey)")
	fs.Uint64Var(&o.afterSequence, "after-sequence", 0, "read events after this sequence")
	fs.Uint64Var(&o.untilSequence, "until-sequence", 0, "follow until this sequence has been read, then exit 0")
	fs.BoolVar(&o.follow, "follow", false, "keep reading new events until Ctrl-C (default: read to the head and exit)")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long, e.g. 30s (default: no limit)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case o.as == "" || o.keyFile == "":
		return nil, errors.New("--as and --key are required")
	case o.group == "" && o.registerWith == "":
		return nil, errors.New("--group is required (unless --register-with only registers)")
	case o.untilSequence > 0 && o.untilSequence <= o.afterSequence:
		return nil, errors.New("--until-sequence must lie after --after-sequence")
	}
	return o, nil
}

func main() {
	o, err := parseOptions(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	} else if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v (see -h)\n", clientName, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", clientName, err)
		os.Exit(1)
	}
}

// agent holds the connection, the open session and the Authority's keys.
type agent struct {
	o          *options
	conn       *grpc.ClientConn
	authority  pb.AuthorityServiceClient
	membership pb.MembershipServiceClient
	keys       map[string]ed25519.PublicKey
	session    *session
}

func run(ctx context.Context, o *options, out io.Writer) error {
	identityKey, err := readKey(o.keyFile)
	if err != nil {
		return err
	}
	a := &agent{o: o}
	// Plain text, as `make run` listens; TLS is not implemented in this example.
	a.conn, err = grpc.DialContext(ctx, o.target, grpc.WithInsecure(),
		grpc.WithUnaryInterceptor(a.proveUnary), grpc.WithStreamInterceptor(a.proveStream))
	if err != nil {
		return err
	}
	defer a.conn.Close()
	a.authority = pb.NewAuthorityServiceClient(a.conn)
	a.membership = pb.NewMembershipServiceClient(a.conn)

	keys, err := a.authority.GetAuthorityKey(ctx, &pb.GetAuthorityKeyRequest{})
	if err != nil {
		return refusal("GetAuthorityKey", err)
	}
	if a.keys, err = authorityKeys(keys, o.pinnedHex); err != nil {
		return err
	}
	logf("Authority key %s, %d in its history", keys.GetKeyId(), len(a.keys))
	if o.registerWith != "" {
		if err := a.register(ctx, identityKey); err != nil || o.group == "" {
			return err
		}
	}
	if err := a.openSession(ctx, identityKey); err != nil {
		return err
	}
	if o.post != "" {
		if err := a.postMessage(ctx); err != nil {
			return err
		}
	}
	return a.read(ctx, out)
}

// register registers --as as an agent identity with the public half of its key, signed by the
// administrator's identity key (register_identity_envelope() in missionweave/sdk/client.py).
func (a *agent) register(ctx context.Context, identityKey ed25519.PrivateKey) error {
	adminKey, err := readKey(a.o.registerWith)
	if err != nil {
		return err
	}
	env, err := signEnvelope(&pb.RegisterIdentityCommand{
		Identity: &pb.Identity{
			IdentityId: a.o.as,
			Kind:       pb.IdentityKind_IDENTITY_KIND_AGENT,
			PublicKey:  identityKey.Public().(ed25519.PublicKey),
		},
		AdminId:   a.o.admin,
		IssuedAt:  timestamppb.Now(),
		RequestId: "req-go-" + hex.EncodeToString(nonce()),
	}, registerIdentityType, adminKey, a.o.admin+"#identity")
	if err != nil {
		return err
	}
	if _, err := a.membership.RegisterIdentity(ctx, &pb.RegisterIdentityRequest{Command: env}); err != nil {
		return refusal("RegisterIdentity", err)
	}
	logf("registered %s (agent)", a.o.as)
	return nil
}

// openSession opens a new session with a fresh session key; the identity key signs only this
// request (open_session_envelope() in missionweave/sdk/client.py: key id "<identity>#identity").
// The new session fences the identity's older ones (MW-11.3-09).
func (a *agent) openSession(ctx context.Context, identityKey ed25519.PrivateKey) error {
	public, sessionKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	env, err := signEnvelope(&pb.OpenSessionCommand{
		IdentityId:       a.o.as,
		SessionPublicKey: public,
		IssuedAt:         timestamppb.Now(),
		Nonce:            nonce(),
	}, openSessionType, identityKey, a.o.as+"#identity")
	if err != nil {
		return err
	}
	resp, err := a.membership.OpenSession(ctx, &pb.OpenSessionRequest{Command: env})
	if err != nil {
		return refusal("OpenSession", err)
	}
	a.session = &session{identityID: a.o.as, epoch: resp.GetSession().GetSessionEpoch(), key: sessionKey}
	logf("session %d of %s opened", a.session.epoch, a.o.as)
	return nil
}

// member reads the Group's state (with a call proof) and --as's active Membership in it, nil for
// an identity that reads without one (an Organization administrator).
func (a *agent) member(ctx context.Context) (*pb.GroupState, *pb.Membership, error) {
	state, err := a.authority.GetGroupState(ctx, &pb.GetGroupStateRequest{GroupId: a.o.group})
	if err != nil {
		return nil, nil, refusal("GetGroupState", err)
	}
	var active *pb.Membership
	for _, m := range state.GetState().GetMemberships() {
		if m.GetMemberId() == a.o.as && m.GetActive() {
			active = m
		}
	}
	return state.GetState(), active, nil
}

// postMessage signs a message.post with the session key and executes it. The Membership epoch
// (and, unless given, the Conversation) comes from the Group's state, read with a call proof.
func (a *agent) postMessage(ctx context.Context) error {
	state, membership, err := a.member(ctx)
	if err != nil {
		return err
	}
	if membership == nil {
		return fmt.Errorf("%s has no active Membership in %s", a.o.as, a.o.group)
	}
	membershipEpoch := membership.GetMembershipEpoch()
	conversation := a.o.conversation
	if conversation == "" {
		conversation = state.GetMission().GetPlanningConversationId()
	}
	command := &pb.Command{
		CommandId:       "go-" + hex.EncodeToString(nonce()),
		GroupId:         a.o.group,
		ActorId:         a.o.as,
		SessionEpoch:    a.session.epoch,
		MembershipEpoch: membershipEpoch,
		IssuedAt:        timestamppb.Now(),
		Body: &pb.Command_MessagePost{MessagePost: &pb.MessagePost{
			ConversationId: conversation,
			Content:        &pb.MessageContent{Text: a.o.post},
		}},
	}
	env, err := signEnvelope(command, commandType, a.session.key, a.session.keyID())
	if err != nil {
		return err
	}
	resp, err := a.authority.ExecuteCommand(ctx, &pb.ExecuteCommandRequest{Command: env})
	if err != nil {
		return refusal("message.post", err)
	}
	// The result's events are signed by the Authority like those read later: checked the same way.
	for _, signed := range resp.GetResult().GetEvents() {
		event, _, err := verifyEvent(a.keys, signed)
		if err != nil {
			return fmt.Errorf("the result of %s: %w", command.GetCommandId(), err)
		}
		logf("posted: %s %s at sequence %d", event.GetType(), event.GetEventId(), event.GetSequence())
	}
	return nil
}

// eventLine is what the agent prints for each verified event.
type eventLine struct {
	Sequence uint64 `json:"sequence"`
	EventID  string `json:"event_id"`
	Type     string `json:"type"`
	ActorID  string `json:"actor_id"`
	KeyID    string `json:"key_id"`
}

// read reads the Group after --after-sequence: to the head and exits, or follows it
// (--follow, --until-sequence). Every event is verified before it is printed.
func (a *agent) read(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	following := a.o.follow || a.o.untilSequence > 0
	// A member sees the Group from its visibility start on (OP-36, MW-8-07): reading from before
	// it, the first batch starts there, which is no gap.
	after := a.o.afterSequence
	_, membership, err := a.member(ctx)
	if err != nil {
		return err
	}
	if start := membership.GetVisibilityStartSequence(); start > after+1 {
		after = start - 1
	}
	stream, err := a.authority.ReadEvents(ctx, &pb.ReadEventsRequest{
		GroupId: a.o.group, AfterSequence: after, Follow: following,
	})
	if err != nil {
		return refusal("ReadEvents", err)
	}
	f := &follower{groupID: a.o.group, keys: a.keys, covered: after, lastSequence: after}
	encoder := json.NewEncoder(out)
	for {
		resp, err := stream.Recv()
		if err == io.EOF && !following {
			return nil
		}
		if err != nil {
			switch {
			case errors.Is(ctx.Err(), context.Canceled) && a.o.untilSequence == 0:
				return nil // Ctrl-C ends --follow
			case errors.Is(ctx.Err(), context.DeadlineExceeded):
				return fmt.Errorf("timed out after %s at sequence %d, waiting for %d", a.o.timeout, f.covered, a.o.untilSequence)
			}
			return refusal(fmt.Sprintf("ReadEvents after sequence %d", f.covered), err)
		}
		if err := f.batch(resp.GetFirstSequence(), resp.GetLastSequence()); err != nil {
			return err
		}
		for _, env := range resp.GetEvents() {
			event, keyID, err := f.event(env)
			if err != nil {
				return err
			}
			line := eventLine{event.GetSequence(), event.GetEventId(), event.GetType(), event.GetActorId(), keyID}
			if err := encoder.Encode(line); err != nil {
				return err
			}
		}
		if a.o.untilSequence > 0 && f.covered >= a.o.untilSequence {
			logf("read through sequence %d", f.covered)
			return nil
		}
	}
}

// Calls that carry no call proof: each is signed in its own way, or public (auth.proto).
var noProof = map[string]bool{
	"/missionweave.v1.AuthorityService/ExecuteCommand":    true,
	"/missionweave.v1.AuthorityService/GetAuthorityKey":   true,
	"/missionweave.v1.MembershipService/OpenSession":      true,
	"/missionweave.v1.MembershipService/RegisterIdentity": true,
}

// withProof adds a fresh call proof for `method` once a session is open: one per call, never
// reused (each nonce is accepted once).
func (a *agent) withProof(ctx context.Context, method string) (context.Context, error) {
	if a.session == nil || noProof[method] {
		return ctx, nil
	}
	proof, err := a.session.callProof(method, a.o.target)
	if err != nil {
		return nil, err
	}
	return metadata.AppendToOutgoingContext(ctx, callProofMetadata, string(proof)), nil
}

func (a *agent) proveUnary(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx, err := a.withProof(ctx, method)
	if err != nil {
		return err
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (a *agent) proveStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	ctx, err := a.withProof(ctx, method)
	if err != nil {
		return nil, err
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// refusal says what the mesh answered: the gRPC code and, from the status details, the
// missionweave.v1.Rejection reason and its metadata (e.g. SIGNATURE_INVALID, field=...).
func refusal(what string, err error) error {
	st := status.Convert(err)
	text := fmt.Sprintf("%s refused: %s: %s", what, st.Code(), st.Message())
	for _, detail := range st.Details() {
		if r, ok := detail.(*pb.Rejection); ok {
			text += " (" + r.GetReason().String()
			for k, v := range r.GetMetadata() {
				text += " " + k + "=" + strconv.Quote(v)
			}
			text += ")"
		}
	}
	return errors.New(text)
}

func logf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, clientName+": "+format+"\n", args...)
}
