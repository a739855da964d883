// The OpenID Provider the sign-on end-to-end test logs in through (tests/e2e/test_sso_oidc.py): the certified
// oidc-provider package with its own development login page (any password; the login name is the account).
//
//   node oidc_provider.mjs PORT ACCOUNTS_JSON CLIENT_ID CLIENT_SECRET REDIRECT_URI
//
// ACCOUNTS_JSON maps a login name to {"email", "groups"}; it is read again at every login, so a test changes a
// person's groups at the provider by rewriting it. Prints "ready" once it listens on 127.0.0.1:PORT.
import fs from 'node:fs';

import Provider from 'oidc-provider';

const [port, accountsFile, clientId, clientSecret, redirectUri] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_post',
  }],
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: { openid: ['sub'], profile: ['preferred_username', 'name'], email: ['email'], groups: ['groups'] },
  // The scopes' claims in the ID token too, as Okta and Keycloak put groups there.
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: true } },
  pkce: { required: () => true },
  cookies: { keys: ['tests-only-cookie-key'] },
  async findAccount(ctx, id) {
    const account = JSON.parse(fs.readFileSync(accountsFile, 'utf8'))[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, preferred_username: id, name: id, email: account.email, groups: account.groups };
      },
    };
  },
});

provider.listen(Number(port), '127.0.0.1', () => console.log('ready'));
