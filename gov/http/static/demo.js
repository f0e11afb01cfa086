/* The demo page of `gov serve --demo`: subscribe this browser, then send it a test notification. */
(() => {
  'use strict';
  const $ = (id) => document.getElementById(id);
  const log = (line) => { $('log').textContent += `${line}\n`; };
  let config = {};

  // The operator's token authorises the two privileged calls; it never leaves this page otherwise.
  async function call(path, body) {
    const answer = await fetch(path, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${$('api-token').value.trim()}` },
      body: JSON.stringify(body),
    });
    const doc = await answer.json().catch(() => ({}));
    if (!answer.ok) throw new Error(`${path}: ${answer.status} ${doc.error || ''}`);
    return doc;
  }

  $('subscribe').addEventListener('click', async () => {
    $('subscribe').disabled = true;
    try {
      const userId = $('user-id').value.trim();
      log(`asking gov for a subscribe token for ${userId} …`);
      const { token } = await call('/demo/token', { userId }); // what your backend does for its user
      log('asking for permission and subscribing at the push service …');
      const sub = await gov.subscribe({ vapidPublicKey: config.vapidPublicKey, endpoint: '/subscriptions', token });
      log(`subscribed: subscription ${sub.subscriptionId} for ${sub.userId}`);
      $('send').disabled = false;
    } catch (e) {
      log(`subscribe failed: ${e.message || e}`);
    } finally {
      $('subscribe').disabled = false;
    }
  });

  $('send').addEventListener('click', async () => {
    const message = {
      userId: $('user-id').value.trim(), tier: $('tier').value, id: `demo-${Date.now()}`,
      title: $('title').value, body: 'Sent from the gov demo page', url: '/demo', campaignId: 'gov-demo',
    };
    try {
      const verdict = await call('/internal/send', message); // through the governor: it may say no
      log(verdict.sent ? `sent ${message.id}: watch for the notification`
        : `suppressed ${message.id}: ${verdict.action} (${verdict.reason})`);
    } catch (e) {
      log(`send failed: ${e.message || e}`);
    }
  });

  fetch('/demo/config.json').then((r) => r.json()).then((c) => {
    config = c;
    const problems = [];
    if (!c.vapidPublicKey) problems.push('no VAPID key: start gov serve with GOV_VAPID_PRIVATE_KEY and GOV_VAPID_SUBJECT');
    if (!c.subscribe) problems.push('no subscribe secret: start gov serve with GOV_SUBSCRIBE_SECRET');
    if (problems.length) { $('config-warning').textContent = problems.join('; '); $('config-warning').hidden = false; }
  });
})();
