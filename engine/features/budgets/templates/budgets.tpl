<h2>Budgets</h2>
<div class="scroll">
<table>
  <thead><tr><th>scope</th><th>subject</th><th>period</th><th>amount</th><th>spent</th>
    <th>reserved</th><th>remaining</th><th>when spent</th><th>resets (UTC)</th></tr></thead>
  <tbody>
% for budget in budgets:
  <tr><td>{{budget['scope']}}</td><td>{{budget['subject'] or '—'}}</td><td>{{budget['period']}}</td>
    <td>{{budget['amount']}}</td><td>{{budget['spent']}}</td><td>{{budget['reserved']}}</td>
    <td>{{budget['remaining']}}</td><td>{{budget['onExceeded']}}</td>
    <td>{{budget['resetsAt'] or 'never'}}</td></tr>
% end
% if not budgets:
  <tr><td colspan="9" class="muted">No budget: PUT /admin-api/ai/budgets sets one.</td></tr>
% end
  </tbody>
</table>
</div>
